"""moescope's serving layer and command line."""
