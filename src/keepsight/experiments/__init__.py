"""World experiments: arms trained from one base model and scored the same way (used by the demo)."""
