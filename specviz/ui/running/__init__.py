"""Running a visitor's job: on the device, in turns with the others', bounded, and stopped when nobody listens."""
