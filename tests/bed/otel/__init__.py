"""A real OpenTelemetry Collector, built from its Go modules (`make otelcol`), and a black hole."""
