"""The checkpoint directory format shared by every strategy."""
