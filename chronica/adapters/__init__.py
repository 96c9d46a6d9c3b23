"""Framework adapters. Each subpackage imports only its own framework, plus core and comm."""
