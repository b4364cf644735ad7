"""Every `spotlight bench` implementation."""
