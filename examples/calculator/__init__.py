"""Calculator task: multi-digit arithmetic a tiny model gets right only with a calculator tool."""
