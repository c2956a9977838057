"""Tests of the documentation: the site builds strictly, links resolve, marked commands run."""
