"""Causes: each module tests one cause and reports evidence, confidence and the unexplained rest."""
