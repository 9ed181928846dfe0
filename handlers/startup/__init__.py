"""What a worker is built from and how: configuration, bucket planning, compiling, the compile cache,
warm-up, AOT packages."""
