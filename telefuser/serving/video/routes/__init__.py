"""The video service's routes, one `APIRouter` per group: `videos` (the OpenAI-style jobs) and `service` (models,
health, metadata, metrics). Their shared state is the app's `VideoService` (service.py), passed as a dependency."""
