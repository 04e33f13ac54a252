"""moescope dashboard (see DESIGN.md; filled in by its issue)."""
