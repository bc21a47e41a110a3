"""Model-based testing: an independent oracle of DESIGN §3 and the random operations it judges."""
