"""``tokenplane rehearse``: one scenario run in the twin and live, side by side."""
