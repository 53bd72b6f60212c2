"""The stream service's routes, one `APIRouter` per group: `service` (health, capacity, metadata, metrics),
`sessions` (the session API, its WebSocket and event stream) and `page` (the web page). Their shared state is the
app's `StreamService` (service.py), passed as a dependency."""
