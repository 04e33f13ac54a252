"""The dashboard in a browser, beside `make demo`'s processes (`bench`)."""
