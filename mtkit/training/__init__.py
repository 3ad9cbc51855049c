"""Training: batching, loss, optimizer and schedule, precision, distribution, checkpoints, the loop."""
