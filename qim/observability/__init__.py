"""What operators see of a running qim: the metric inventory of spec 24.1, structured logs."""
