"""Tiny in-repo plugins used to test discovery through entry points."""
