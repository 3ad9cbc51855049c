"""A user's text to the engines' sentences and back: reading lines and formatting translations (lines.py),
markup carried by word alignment (markup.py), glossaries (glossary.py); sentence splitting, the integrity
guard and documents join them here.

Importing this package loads no submodule (and no torch).
"""
