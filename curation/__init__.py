"""Curation: the store every stage writes to, the review UI and the dataset export."""
