"""Optional integrations with third-party tools. Each submodule imports its tool lazily, so importing
``keepsight.integrations.<name>`` works without that tool installed.

- ``lmms_eval``: a ``keepsight`` model for lmms-eval (``pip install 'keepsight[lmms]'``).
"""
