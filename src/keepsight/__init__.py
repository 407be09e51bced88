"""keepsight: keep vision-language models looking at the image through long generation."""

__version__ = "0.1.0"
