"""Training backends other than the embedded one. Each subpackage is the only place its framework is imported."""
