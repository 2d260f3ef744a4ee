"""Training: loss scaling and the settings of data-parallel and sharded steps."""
