"""Checks several properties share (the assertions vocabulary of one area each): a property module imports
these, never another property module."""
