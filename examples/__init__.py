"""Example tasks: data preparation and configs for real tool-use training runs."""
