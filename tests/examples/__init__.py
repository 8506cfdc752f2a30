"""Tests of the examples under examples/, installed as their users would install them."""
