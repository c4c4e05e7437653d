"""A deterministic product catalogue and customer base for the synthetic commerce traffic.

Built from a fixed seed, independent of the log generator's seed, so product ids mean the same
thing in every generated dataset (the model can learn them; features can join on them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache, lru_cache

from pipelines.logs.tools import COLORS, CURRENCIES

# category -> (product nouns, brands, (min price, max price) in USD, uses clothing sizes)
CATEGORY_SPECS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[float, float], bool]] = {
    "apparel": (
        (
            "t-shirt",
            "hoodie",
            "denim jacket",
            "summer dress",
            "chinos",
            "wool sweater",
            "rain jacket",
            "polo shirt",
            "leggings",
            "linen shirt",
        ),
        ("Northwind", "Urban Thread", "Patagonia", "Levi's", "Uniqlo", "Zara"),
        (9.0, 180.0),
        True,
    ),
    "footwear": (
        ("running shoes", "sneakers", "hiking boots", "sandals", "loafers", "ankle boots", "slippers"),
        ("Nike", "Adidas", "Allbirds", "Merrell", "Birkenstock", "Dr. Martens"),
        (19.0, 240.0),
        True,
    ),
    "electronics": (
        (
            "wireless earbuds",
            "bluetooth speaker",
            "usb-c charger",
            "4k monitor",
            "mechanical keyboard",
            "noise cancelling headphones",
            "smart watch",
            "tablet",
            "webcam",
            "power bank",
        ),
        ("Sony", "Anker", "Samsung", "Logitech", "Apple", "JBL", "Bose"),
        (15.0, 1400.0),
        False,
    ),
    "home": (
        ("throw blanket", "table lamp", "area rug", "scented candle", "picture frame", "duvet cover", "floor mirror"),
        ("IKEA", "West Elm", "Brooklinen", "Yankee Candle"),
        (8.0, 450.0),
        False,
    ),
    "kitchen": (
        (
            "coffee maker",
            "chef knife",
            "cast iron skillet",
            "air fryer",
            "blender",
            "espresso machine",
            "cutting board",
        ),
        ("Breville", "Lodge", "KitchenAid", "Ninja", "OXO", "Le Creuset"),
        (12.0, 800.0),
        False,
    ),
    "beauty": (
        ("moisturizer", "sunscreen", "lipstick", "hair dryer", "perfume", "face serum"),
        ("CeraVe", "Dyson", "L'Oreal", "The Ordinary", "Clinique"),
        (6.0, 450.0),
        False,
    ),
    "sports": (
        ("yoga mat", "dumbbells", "tennis racket", "cycling helmet", "water bottle", "camping tent"),
        ("Lululemon", "Wilson", "Yeti", "Garmin", "Coleman", "Decathlon"),
        (10.0, 600.0),
        False,
    ),
    "toys": (
        ("lego set", "board game", "plush bear", "puzzle", "remote control car", "doll house"),
        ("LEGO", "Hasbro", "Mattel", "Ravensburger", "Melissa & Doug"),
        (8.0, 250.0),
        False,
    ),
    "jewelry": (
        ("necklace", "earrings", "bracelet", "engagement ring", "watch"),
        ("Pandora", "Tiffany", "Swarovski", "Fossil"),
        (20.0, 3000.0),
        False,
    ),
    "books": (
        ("cookbook", "mystery novel", "children's book", "travel guide", "biography"),
        ("Penguin", "HarperCollins", "Lonely Planet"),
        (5.0, 60.0),
        False,
    ),
    "grocery": (
        ("coffee beans", "olive oil", "green tea", "protein bars", "dark chocolate"),
        ("Lavazza", "Kirkland", "Twinings", "Lindt"),
        (3.0, 60.0),
        False,
    ),
    # Only in drift scenarios ("new-category"): the baseline never sees them.
    "pet_supplies": (
        ("dog bed", "cat tree", "dog leash", "pet carrier", "cat litter", "dog food"),
        ("Kong", "Purina", "PetSafe", "Chewy"),
        (6.0, 220.0),
        False,
    ),
    "garden": (
        ("garden hose", "lawn mower", "planter pot", "pruning shears", "bird feeder"),
        ("Gardena", "Fiskars", "Greenworks"),
        (7.0, 500.0),
        False,
    ),
}
BASELINE_CATEGORIES = tuple(c for c in CATEGORY_SPECS if c not in ("pet_supplies", "garden"))
NEW_CATEGORIES = ("pet_supplies", "garden")

# country -> (currency, weight in the baseline market mix)
BASELINE_MARKETS: dict[str, tuple[str, float]] = {
    "US": ("USD", 0.55),
    "GB": ("GBP", 0.12),
    "CA": ("CAD", 0.10),
    "AU": ("AUD", 0.08),
    "DE": ("EUR", 0.05),
    "FR": ("EUR", 0.04),
    "MX": ("MXN", 0.03),
    "IN": ("INR", 0.03),
}
# A new market opening ("locale" drift).
NEW_MARKETS: dict[str, tuple[str, float]] = {"JP": ("JPY", 0.4), "BR": ("BRL", 0.3), "ES": ("EUR", 0.3)}
FX_PER_USD = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "CAD": 1.37,
    "AUD": 1.52,
    "JPY": 151.0,
    "MXN": 17.1,
    "BRL": 5.0,
    "INR": 83.0,
}
if set(FX_PER_USD) != set(CURRENCIES):
    raise RuntimeError("FX_PER_USD must name exactly the generator's currencies")
CHANNELS = ("web", "mobile_app", "chat_widget", "voice", "api")
CHANNEL_WEIGHTS = (0.38, 0.34, 0.18, 0.04, 0.06)


@dataclass(frozen=True, slots=True)
class Product:
    product_id: str
    category: str
    noun: str
    brand: str
    price_usd: float
    color: str
    sized: bool


@dataclass(frozen=True, slots=True)
class Customer:
    customer_id: str
    country: str
    currency: str
    channel: str
    favourite_categories: tuple[str, ...]
    first_name: str
    last_name: str


FIRST_NAMES = (
    "Maria",
    "James",
    "Aisha",
    "Chen",
    "Olivia",
    "Liam",
    "Sofia",
    "Noah",
    "Priya",
    "Lucas",
    "Emma",
    "Mateo",
    "Yuki",
    "Fatima",
    "Ethan",
    "Ava",
    "Omar",
    "Mia",
    "Diego",
    "Hannah",
)
LAST_NAMES = (
    "Garcia",
    "Smith",
    "Khan",
    "Wang",
    "Johnson",
    "Brown",
    "Rossi",
    "Müller",
    "Patel",
    "Silva",
    "Nguyen",
    "Kim",
    "Martin",
    "Dubois",
    "Lopez",
    "Tanaka",
    "Okafor",
    "Cohen",
)
STREETS = (
    "Elm Street",
    "Oak Avenue",
    "Maple Drive",
    "Main Street",
    "Sunset Boulevard",
    "High Street",
    "Park Lane",
    "Cedar Road",
    "Lakeview Court",
    "Church Road",
)
CITIES = ("Springfield", "Portland", "Austin", "Leeds", "Toronto", "Melbourne", "Denver", "Bristol")


@lru_cache(maxsize=1)
def products() -> tuple[Product, ...]:
    rng = random.Random(20261122)
    out: list[Product] = []
    for category, (nouns, brands, (low, high), sized) in CATEGORY_SPECS.items():
        for noun in nouns:
            for brand in rng.sample(brands, k=min(3, len(brands))):
                price = round(min(high, max(low, rng.lognormvariate(0, 0.6) * (low + high) / 4)), 2)
                out.append(Product(f"PRD-{len(out):06d}", category, noun, brand, price, rng.choice(COLORS), sized))
    return tuple(out)


@cache
def products_by_category() -> dict[str, tuple[Product, ...]]:
    grouped: dict[str, list[Product]] = {}
    for p in products():
        grouped.setdefault(p.category, []).append(p)
    return {k: tuple(v) for k, v in grouped.items()}


@lru_cache(maxsize=4)
def customers(n: int = 5000, markets: tuple[tuple[str, str, float], ...] | None = None) -> tuple[Customer, ...]:
    rng = random.Random(7_000_000 + n)
    market_rows = markets or tuple((c, cur, w) for c, (cur, w) in BASELINE_MARKETS.items())
    countries = [m[0] for m in market_rows]
    weights = [m[2] for m in market_rows]
    currency = {m[0]: m[1] for m in market_rows}
    prefix = "cus" if markets is None else "cux"
    out = []
    for i in range(n):
        country = rng.choices(countries, weights)[0]
        out.append(
            Customer(
                customer_id=f"{prefix}_{i:07d}",
                country=country,
                currency=currency[country],
                channel=rng.choices(CHANNELS, CHANNEL_WEIGHTS)[0],
                favourite_categories=tuple(rng.sample(BASELINE_CATEGORIES, k=2)),
                first_name=rng.choice(FIRST_NAMES),
                last_name=rng.choice(LAST_NAMES),
            )
        )
    return tuple(out)
