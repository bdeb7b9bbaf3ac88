"""Drivers that turn a request into verified schedules: step search, alpha-beta, baselines, and the choice."""
