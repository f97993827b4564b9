"""Plain data shared by the controller and the ranks: the example and the inputs derived from it, the case
types properties draw, the views ranks send back, backend names, the import probe and the API surface.

Both sides import this layer; it imports nothing else of the suite (only torch and the standard library).
"""
