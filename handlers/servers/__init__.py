"""The servers at the edge: TorchServe and Ray, each in its room, over the server-neutral inference API
and archive reading."""
