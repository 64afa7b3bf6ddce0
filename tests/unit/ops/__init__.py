"""Unit tests of calculet.ops: calctl up arguments and banner, LocalFleet without processes."""
