"""The mirror's pure rules: sources, file states, sizing."""
