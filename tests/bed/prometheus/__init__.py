"""A real Prometheus and promtool, built from their Go module (`make prometheus`)."""
