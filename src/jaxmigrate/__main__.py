"""`python -m jaxmigrate`: the same as the `jaxmigrate` command."""

from jaxmigrate.cli import main

main()
