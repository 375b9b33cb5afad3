"""The `kiln` command line (see `kiln --help`)."""
