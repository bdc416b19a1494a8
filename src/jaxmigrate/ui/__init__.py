"""Everything the user sees, rendered with rich; the only package besides cli/ importing it."""
