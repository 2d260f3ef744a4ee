"""Tests of training steps: graphamp.training, graphamp.fx's step, the step passes."""
