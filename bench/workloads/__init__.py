"""One module per system, each with the same workloads written the way its users write them."""
