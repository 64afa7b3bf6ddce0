"""Model packages: manifest, loader, validator and capacity planning (DESIGN.md section 5)."""
