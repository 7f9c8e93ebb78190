"""The loop around a deployment: capacity for a target load, the check after a release, and the
comparison of two endpoints, each measured with the same load generator and noise rule."""
