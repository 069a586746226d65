-- Whether one item is eligible for a stage now. Parameters: item.
SELECT (${eligible}) FROM media_items mi WHERE mi.id = %(item)s
