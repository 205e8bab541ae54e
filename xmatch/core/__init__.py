"""The ground floor: registries, specs, the zoo loader, errors, and small shared utilities."""
