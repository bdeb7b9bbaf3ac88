"""jinja2 templates used by the backends."""
