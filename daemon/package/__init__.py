"""Model packages: manifest, loader, validator and capacity planning (docs/package.md)."""
