"""Tests against a real Redis (started by the session; see conftest)."""
