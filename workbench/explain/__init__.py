"""`workbench explain`: from the error text a user holds to its ranked causes, confirmed on their model."""
