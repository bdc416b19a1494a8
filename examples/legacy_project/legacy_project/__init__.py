"""A small JAX project written against the legacy parallel APIs, for jaxmigrate to migrate."""
