"""data: the data path (notebook 07): sources, batches, statistics, template, token view"""
