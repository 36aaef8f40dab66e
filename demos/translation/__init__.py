"""A made-up low-resource language -> English (CALM paper, section 4.2, in miniature): python -m demos.translation."""
