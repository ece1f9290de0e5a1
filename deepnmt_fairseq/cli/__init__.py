"""Console tools of the plugin."""
