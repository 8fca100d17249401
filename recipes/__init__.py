"""Built-in recipes, installed as the package `framework.recipes` (`framework cp NAME DEST` copies one)."""
