"""Unit tests of the noiseless privacy family (issue #7)."""
