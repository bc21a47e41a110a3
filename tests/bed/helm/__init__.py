"""helm, built from its Go module (`make helm`), and the chart rendered into deploy/ and docs/."""
