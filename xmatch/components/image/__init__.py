"""Image encoders and the shared timm backbone."""
