"""int8: quantizing a model, its gate against float32, and the calibration texts."""
