"""Docker sandboxes: the runtime, its containers, their isolated network, published ports and egress proxy."""
