"""Guarding the server: limits, input checks, admission, sessions, disk and the middleware."""
